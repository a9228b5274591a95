import sys

from npas.cli import main

sys.exit(main())
