"""One generation's rounds: drafting against the drafter protocol, the target's verify pass (a chain or a tree, alone
or batched), acceptance and sampling, the draft-length policies, the clock, and the lossless check. Knows no drafter
by name."""
