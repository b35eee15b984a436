"""``python -m ivit_onnx.validate``."""

import sys

from .cli import main

sys.exit(main())
