"""``python -m ivit_onnx.validate``."""

import sys

from .cli import main

if __name__ == "__main__":  # importing the module (e.g. the wheel step's --import-all) must not run the CLI
    sys.exit(main())
