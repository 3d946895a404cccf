import sys

from perfkit.cli import main

sys.exit(main())
