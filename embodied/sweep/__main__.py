"""python -m embodied.sweep: see `embodied.sweep`."""

import sys

from embodied.sweep import cli

if __name__ == '__main__':
    sys.exit(cli.main())
