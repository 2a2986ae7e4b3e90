"""`python -m elastic.driver.cli ...` runs `elasticrun ...`."""

import sys

from elastic.driver.cli.main import main

if __name__ == "__main__":  # importing it (an import walk) runs nothing
    sys.exit(main())
