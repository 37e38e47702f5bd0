"""A helper the script runs as a Python subprocess (as repos do for git info or a tokenizer):
it needs no torch, and reports what its process imported."""

import json
import sys

if __name__ == "__main__":
    print(json.dumps({"torch": "torch" in sys.modules,
                      "ddpviz": sorted(m for m in sys.modules if m.startswith("ddpviz"))}))
