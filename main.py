"""TrainDeck: `python main.py` opens the app; `python main.py <command>` runs headless (see --help)."""

import os
import sys
import time

STARTED = time.time()  # a command's budget counts from here (`auto --minutes`: the imports are the budget's too)


def main() -> int:
    if sys.platform == "darwin":  # before torch loads: an operation Apple's GPU lacks runs on the CPU, with a warning
        from trainer.device.mps import FALLBACK_ENV

        os.environ.setdefault(FALLBACK_ENV, "1")
    from trainer.cli import COMMANDS

    if len(sys.argv) > 1 and (sys.argv[1] in COMMANDS or sys.argv[1] in ("-h", "--help")):
        from trainer.cli import main as cli_main
        from trainer.core import clock

        clock.mark_command_start(STARTED)
        from trainer.core.system import claim_stop_file

        claim_stop_file()  # a command roots a process tree of its own, or joins the one it was started in

        if sys.argv[1] in ("-h", "--help"):
            print("python main.py [--config FILE] [--runs-dir DIR] [--autostart]   open the app\n"
                  f"python main.py {{{','.join(COMMANDS)}}} ...   headless; add --help for each\n")
        return cli_main(sys.argv[1:] if sys.argv[1] in COMMANDS else ["--help"])
    from app.main import run_app

    return run_app(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
