import sys

from psoperator.cli import main

sys.exit(main())
