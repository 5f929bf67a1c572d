import sys

from superoffload.cli.main import console

sys.exit(console())
