"""Score signatures: one type for every scorer, sacrebleu-style (spec section 8).

A signature names everything that changes a scorer's numbers: the metric, then ``key:value`` fields in a
fixed order, joined by ``|``, e.g. ``QACE-Ref|qg:sha256-bd71f3310b2b|qa:...|prec:fp32|...|spec:2``. Rows
carry it, resumed outputs must match it, and numbers are comparable only when it is equal. The short form
drops the fields that identify models (their hashes), for tables and plots where the full form is long.
"""

from __future__ import annotations

from dataclasses import dataclass

from qace._version import __version__
from qace.errors import ConfigError

MODEL_KEYS = frozenset({"qg", "qa", "vqa", "feat", "bs", "vlm", "gen", "enc", "clip"})
"""Fields that identify a model or QACE-Img's region features (a hub id or a content hash);
`Signature.short` leaves them out."""


@dataclass(frozen=True)
class Signature:
    """A metric name and its ordered ``key:value`` fields; ``str()`` is the signature rows carry."""

    metric: str
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, metric: str, *fields: tuple[str, object]) -> Signature:
        """The signature of ``metric`` with ``fields`` as (key, value) pairs, in order."""
        return cls(metric, tuple((key, str(value)) for key, value in fields))

    @classmethod
    def of_scorer(cls, metric: str, *fields: tuple[str, object], spec: str | None = None) -> Signature:
        """A scorer's signature, the one way every scorer builds it: ``fields`` (what changes its numbers),
        then qace's ``version``, then ``spec``, the version of the scorer's own decisions, when it has one."""
        tail = [("version", __version__)] + ([] if spec is None else [("spec", spec)])
        return cls.of(metric, *fields, *tail)

    @classmethod
    def parse(cls, text: str) -> Signature:
        """Read a signature back; `ConfigError` names a field without ``key:value`` form."""
        head, *rest = text.split("|")
        fields = []
        for part in rest:
            key, sep, value = part.partition(":")
            if not sep:
                raise ConfigError(f"malformed signature field {part!r} in {text!r}")
            fields.append((key, value))
        return cls(head, tuple(fields))

    def __str__(self) -> str:
        return "|".join([self.metric, *(f"{key}:{value}" for key, value in self.fields)])

    def short(self) -> str:
        """The signature without the fields that identify models (`MODEL_KEYS`)."""
        kept = tuple(field for field in self.fields if field[0] not in MODEL_KEYS)
        return str(Signature(self.metric, kept))

    def as_dict(self) -> dict[str, str]:
        """``{"metric": name, **fields}``."""
        return {"metric": self.metric, **dict(self.fields)}
