import sys

from qwen_onnx.cli import main

sys.exit(main())
