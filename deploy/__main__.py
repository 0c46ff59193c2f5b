"""``python -m deploy``: create, delete or transform (deploy/deploy.py)."""

import sys

from .deploy import main

sys.exit(main())
