import sys

from hetbench.cli import main

sys.exit(main())
