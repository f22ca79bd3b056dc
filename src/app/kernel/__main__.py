"""python -m app.kernel <kernel> [<version>] --prof_type=event|annotation|ncu|nsys"""
import sys

from app.kernel.cli import main

if __name__ == "__main__":        # Dask's spawned worker processes import this module too
    sys.exit(main())
