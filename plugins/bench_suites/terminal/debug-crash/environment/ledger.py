#!/usr/bin/env python3
"""Prints the ledger's weighted checksum. It crashes on this ledger."""

LEDGER = [561, 793, 257, 334, 688, 281, 475, 296, 837, 513, 663, 690, 817, 366, 357, 281, 660, 354, 756, 961,
          849, 419, 359, 945]


def checksum(values: list[int]) -> int:
    key = 7919
    total = 0
    for v in values:
        key = (key * 31 + v) % 1000003
        weight = key % 89 - 7
        total += v * 1000 // weight
    return total


if __name__ == "__main__":
    print(f"checksum: {checksum(LEDGER)}")
