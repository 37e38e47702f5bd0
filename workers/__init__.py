"""ddpviz workers: Redis + RQ between the app and the engine.

Importing this package points RQ at ddpviz's key prefix (``ddpviz:rq``) before RQ is imported,
so every key ddpviz writes, RQ's included, lives under ``ddpviz:``. The variable is exported
through the environment, so worker subprocesses inherit it.

Raises:
    ImportError: if RQ was imported earlier in this process with another key prefix (the client
        and the workers would then look at different queues).
"""

from __future__ import annotations

import os
import sys

from workers.keys import RQ_KEY_PREFIX

os.environ["RQ_KEY_PREFIX"] = RQ_KEY_PREFIX
if "rq.defaults" in sys.modules and sys.modules["rq.defaults"].RQ_KEY_PREFIX != RQ_KEY_PREFIX:
    raise ImportError(
        f"rq was imported before workers with key prefix "
        f"{sys.modules['rq.defaults'].RQ_KEY_PREFIX!r}; import workers first (or set "
        f"RQ_KEY_PREFIX={RQ_KEY_PREFIX}) so ddpviz's queue keys live under 'ddpviz:'")
