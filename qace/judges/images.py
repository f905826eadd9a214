"""Read the image file a record points to, turning every failure into a per-record reason.

Judges that look at pixels (VisCE², the regeneration score) need the image itself. A missing,
truncated or undecodable file must cost one record, not the run, so `load_image` raises
`ImageError` with a reason that names the file; scorers turn it into a `RecordError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qace.errors import InputError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

MAX_PIXELS = 40_000_000
"""Refuse images above this many pixels (a decompression bomb or a mistake, never a photo to judge)."""


class ImageError(InputError):
    """An image file is missing, unreadable or not an image."""


def load_image(path: str | Path) -> PILImage:
    """Decode ``path`` (JPEG, PNG, WebP, BMP, GIF, TIFF: whatever Pillow reads) as an RGB image.

    The image is fully decoded before the file is closed, so a bad file fails here and not later
    inside a model's preprocessing.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise ImageError(f"image file {str(path)!r} does not exist")
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise ImageError(f"image {str(path)!r} is {width}x{height}, over {MAX_PIXELS} pixels")
            return image.convert("RGB")
    except UnidentifiedImageError:
        raise ImageError(f"{str(path)!r} is not an image file Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise ImageError(f"cannot decode image {str(path)!r}: {exc}") from None
