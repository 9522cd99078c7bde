import sys

from powerctl.cli import main

sys.exit(main())
