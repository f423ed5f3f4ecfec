"""`python -m ray_ormas ...`: the same as the `ray-ormas` command."""

import sys

from ray_ormas._internal.cli.main import main

sys.exit(main())
