"""Convert integers to Roman numerals and back."""

_NUMERALS = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]


def to_roman(n: int) -> str:
    """Return the Roman numeral for 1 <= n <= 3999."""
    if not 0 < n < 4000:
        raise ValueError(f"out of range: {n}")
    out = []
    for value, numeral in _NUMERALS:
        while n > value:
            out.append(numeral)
            n -= value
    return "".join(out)


def from_roman(text: str) -> int:
    """Return the integer a canonical Roman numeral stands for."""
    total = 0
    rest = text
    for value, numeral in _NUMERALS:
        while rest.startswith(numeral):
            total += value
            rest = rest[len(numeral):]
    if rest or not text:
        raise ValueError(f"not a Roman numeral: {text!r}")
    return total
