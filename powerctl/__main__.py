import sys

from powerctl.cli.commands import main

sys.exit(main())
