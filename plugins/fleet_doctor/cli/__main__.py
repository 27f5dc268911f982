import sys

from fleet_doctor.cli.main import main

sys.exit(main())
