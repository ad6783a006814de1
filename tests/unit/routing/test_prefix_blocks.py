from infer.routing.prefix_blocks import block_hashes


def test_token_prompts_hash_their_full_blocks_only() -> None:
    assert len(block_hashes(list(range(47)), 16, 64)) == 2
    assert len(block_hashes(list(range(48)), 16, 64)) == 3
    assert block_hashes(list(range(15)), 16, 64) == []


def test_text_prompts_are_cut_in_characters() -> None:
    assert len(block_hashes("x" * 130, 16, 64)) == 2


def test_a_block_hash_covers_every_block_before_it() -> None:
    shared = list(range(32))
    a = block_hashes([*shared, *range(100, 116)], 16, 64)
    b = block_hashes([*shared, *range(200, 216)], 16, 64)
    assert a[:2] == b[:2] and a[2] != b[2]
    # the same third block after a different first one is another block
    c = block_hashes([*range(50, 66), *range(16, 32), *range(100, 116)], 16, 64)
    assert c[1] != a[1] and c[2] != a[2]


def test_tokens_and_text_never_share_a_block() -> None:
    assert set(block_hashes([65] * 64, 16, 64)).isdisjoint(block_hashes("A" * 64, 16, 64))
