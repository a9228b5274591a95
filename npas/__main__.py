import sys

from npas.presentation.cli import main

sys.exit(main())
