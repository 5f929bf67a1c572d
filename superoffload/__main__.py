import sys

from superoffload.cli.main import main

sys.exit(main())
