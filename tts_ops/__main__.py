"""`python -m tts_ops`: the same commands as the `tts-ops` console script."""

import sys

from tts_ops.cli import main

sys.exit(main())
