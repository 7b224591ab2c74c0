"""Token-budget micro-batches (algo.micro_batch_tokens): the packing rule, by hand."""

from harness.rl.batch import pack_by_tokens


def test_longest_first_and_budget_counts_padding():
    # lengths 10, 50, 20, 40 with budget 100: 50 alone would allow one more row of <= 50 (2 x 50 = 100)
    assert pack_by_tokens([[0], [1], [2], [3]], [10, 50, 20, 40], 100) == [[1, 3], [2, 0]]


def test_a_unit_over_budget_gets_its_own_pass_and_units_stay_whole():
    units = [[0, 1, 2], [3], [4, 5]]
    # unit 0: 3 rows x 30 = 90 > 60, alone; unit 2 (2 x 20) and unit 1 (3 x 20 = 60) fit together
    assert pack_by_tokens(units, [30, 10, 20], 60) == [[0, 1, 2], [4, 5, 3]]


def test_ties_keep_their_order_and_every_row_appears_once():
    packed = pack_by_tokens([[i] for i in range(7)], [5] * 7, 15)
    assert packed == [[0, 1, 2], [3, 4, 5], [6]]


def test_row_groups_in_order_by_size_or_packed_by_length():
    from harness.rl.batch import row_groups

    assert row_groups([5, 9, 2, 7, 1], 2, 0) == [[0, 1], [2, 3], [4]]
    # budget 18, longest first: 9 and 7 (2 x 9 = 18); then 5, 2 and 1 (3 x 5 = 15); each group in row order
    assert row_groups([5, 9, 2, 7, 1], 2, 18) == [[1, 3], [0, 2, 4]]
