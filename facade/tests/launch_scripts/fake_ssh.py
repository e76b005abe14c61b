"""A stand-in for `ssh [OPTIONS] [--] HOST COMMAND...` in launcher tests: the remote-shell step without a network.

sshd joins the words after the host with spaces and runs the result with the user's shell, as
`sh -c LINE`; this does the same on this machine, so quoting mistakes show exactly as on a real
node. Options are skipped as OpenSSH's getopt does (a letter that takes a value takes the rest of
the word or the next word; `--` ends the options). Each host asked for is appended to $FAKE_SSH_LOG.
"""

import os
import sys

TAKES_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def main(args: list[str]) -> None:
    while args and args[0].startswith("-") and args[0] != "-":
        word = args.pop(0)
        if word == "--":
            break
        for i, letter in enumerate(word[1:], start=1):
            if letter in TAKES_VALUE:
                if i == len(word) - 1:
                    args.pop(0)  # the value is the next word
                break
    host, line = args[0], " ".join(args[1:])
    with open(os.environ["FAKE_SSH_LOG"], "a") as log:
        log.write(host + "\n")
    os.execv("/bin/sh", ["sh", "-c", line])


if __name__ == "__main__":
    main(sys.argv[1:])
