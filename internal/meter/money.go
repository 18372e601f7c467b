// Package meter meters sandboxes' usage (issue 16, docs/usage.md): the
// tick that advances the open usage segments of internal/store, and the
// usage report — seconds per sandbox from start to end at a granularity
// (1 s), a minimum per sandbox (60 s), paused time priced for disk only —
// grouped by sandbox, template, tariff, day or eval run and priced with
// each sandbox's tariff as it was at its create.
//
// Money is int64 nano-units of the operator's currency (no float money):
// prices per second are small (0.000014 a vCPU-second is 14000), and a
// total of 9.2 billion units fits.
package meter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Nano is one unit of money, in nano-units.
const Nano = 1_000_000_000

// MaxPrice bounds a tariff's price per second (1000 units a second), and
// MaxEntry a ledger entry (a million units): with them no cost or balance
// overflows int64 (prices × shapes × seconds stay below 2^63, and a
// balance would need millions of top-ups of the maximum).
const (
	MaxPrice = 1000 * Nano
	MaxEntry = 1_000_000 * Nano
)

// ParseMoney parses a non-negative decimal amount ("0.000014", "12", "3.5")
// of at most 9 decimals into nano-units.
func ParseMoney(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("empty amount")
	}
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" {
		whole = "0"
	}
	if len(frac) > 9 {
		return 0, fmt.Errorf("amount %q has more than 9 decimals", s)
	}
	for _, r := range whole + frac {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("amount %q is not a non-negative decimal number", s)
		}
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > (1<<63-1)/Nano-1 {
		return 0, fmt.Errorf("amount %q is too large", s)
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	}
	return w*Nano + f, nil
}

// FormatMoney formats nano-units as a decimal ("0.000014", "12.5", "0"),
// without trailing zeros.
func FormatMoney(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	s := fmt.Sprintf("%s%d.%09d", sign, n/Nano, n%Nano)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
