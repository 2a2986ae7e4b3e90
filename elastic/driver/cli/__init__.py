"""`elasticrun`: the command line.

`elasticrun [flags] COMMAND` launches a job: its flags (`launcher_flags.py`, horovodrun's
names) may also come from `ELASTICRUN_*` variables or a YAML `--config-file`
(`flag_sources.py`, `config_file.py`), and `main.py` reads them into `Settings` and runs the
job. `elasticrun status|drain|undrain|stop` (`job_commands.py`) talk to a running job's
driver, found through this user's job file or etcd; `status_text.py` renders what it says.
"""

from elastic.driver.cli.main import main

__all__ = ["main"]
