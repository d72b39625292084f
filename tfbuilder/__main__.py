import sys

from tfbuilder.cli.commands import main

sys.exit(main())
