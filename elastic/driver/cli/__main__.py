"""`python -m elastic.driver.cli ...` runs `elasticrun ...`."""

import sys

from elastic.driver.cli.main import main

sys.exit(main())
