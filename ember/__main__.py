import sys

from ember.cli import main

sys.exit(main())
