"""`python -m embodied.run.parallel`: the same command line as `embodied.main`."""

from embodied import main

main.main()
