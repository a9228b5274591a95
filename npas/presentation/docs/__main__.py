"""`python -m npas.presentation.docs`: rewrite docs/'s generated sections (`--check`: report only)."""

from __future__ import annotations

import sys

from npas.presentation.docs import main

sys.exit(main())
