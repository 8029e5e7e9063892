"""Storage: the fleet's database engines, the turn table and its fence, side-effect records."""
