import sys

from wordstat.counting import counts


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: wordstat FILE", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        lines, words, chars = counts(f.read())
    print(f"{lines} {words} {chars} {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
