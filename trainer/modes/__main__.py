"""``python -m relax_gym.trainer.modes CONFIG ...`` is ``relax-gym train CONFIG ...`` (every mode)."""

import sys

from relax_gym.cli.main import main

sys.exit(main(["train", *sys.argv[1:]]))
