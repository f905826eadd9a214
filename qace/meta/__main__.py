"""``python -m qace.meta report|agreement|correlate|export ...`` (same as ``qace meta ...``)."""

import sys

from qace.meta.cli import main

sys.exit(main())
