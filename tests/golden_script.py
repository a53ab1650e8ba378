"""A stage in a file run as a script, whose snapshot fingerprint scheme 2 wrote (naming its code
``__main__.golden_script_rows``, where scheme 3 has ``golden_script.golden_script_rows``) under
tests/golden/stages/scheme2-script (see tests/test_upgrade.py).

Do not edit ``golden_script_rows``: its snapshot is found by the fingerprint of its code.

``python tests/golden_script.py <root>`` materializes the stage under ``root`` and prints its
fingerprint and the texts it read, as JSON; its INFO log lines go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys


def golden_script_rows(n):
    for i in range(n):
        yield {"i": i, "text": f"script {i}"}


def main() -> None:
    from snapstore import snapshot

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    snap = snapshot(golden_script_rows, root=sys.argv[1])(12)
    snap.materialize()
    texts = [str(sample["text"]) for sample in snap]
    print(json.dumps({"fingerprint": snap.fingerprint, "texts": texts}))
    snap.close()


if __name__ == "__main__":
    main()
