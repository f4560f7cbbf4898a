import sys

from fbnas._cli import main

sys.exit(main())
