import sys

from fbnas.cli import main

sys.exit(main())
