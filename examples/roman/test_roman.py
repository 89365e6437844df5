import unittest

from roman import from_roman, to_roman


class ToRoman(unittest.TestCase):
    def test_small_numbers(self):
        self.assertEqual(to_roman(1), "I")
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")

    def test_larger_numbers(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(2024), "MMXXIV")
        self.assertEqual(to_roman(3999), "MMMCMXCIX")

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)
        with self.assertRaises(ValueError):
            to_roman(4000)


class RoundTrip(unittest.TestCase):
    def test_every_number(self):
        for n in range(1, 4000):
            self.assertEqual(from_roman(to_roman(n)), n)


if __name__ == "__main__":
    unittest.main()
