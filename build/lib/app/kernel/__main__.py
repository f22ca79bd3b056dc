"""python -m app.kernel <kernel> [<version>] --prof_type=event|annotation|ncu|nsys"""
import sys

from app.kernel.cli import main

sys.exit(main())
