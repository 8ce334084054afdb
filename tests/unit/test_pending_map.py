"""The committed-plus-pending map (consumers.runtime.pending)."""

from __future__ import annotations

from consumers.runtime.pending import PendingMap, kept


def test_a_put_is_seen_inside_the_transaction_and_committed_only_on_commit() -> None:
    m: PendingMap[str, int, int] = PendingMap(kept)
    m.committed["a"] = 1
    m.put("a", 2)
    m.put("b", 3)
    assert (m.get("a"), m.get("b"), "b" in m) == (2, 3, True)
    assert m.committed == {"a": 1}
    assert m.commit() == {"a": 2, "b": 3}
    assert m.committed == {"a": 2, "b": 3} and m.staged_keys() == []


def test_an_abort_leaves_the_committed_entries_as_they_were() -> None:
    m: PendingMap[str, int, int] = PendingMap(kept)
    m.committed["a"] = 1
    m.put("a", 5)
    m.drop("a")
    m.put("c", 7)
    m.abort()
    assert (m.get("a"), m.get("c"), "c" in m) == (1, None, False)
    assert m.commit() == {} and m.committed == {"a": 1}


def test_a_drop_hides_the_key_now_and_removes_it_on_commit() -> None:
    m: PendingMap[str, int, int] = PendingMap(kept)
    m.committed.update(a=1, b=2)
    m.drop("a")
    assert ("a" in m, m.get("a"), m.is_dropped("a"), m.staged("a")) == (False, None, True, None)
    assert m.committed == {"a": 1, "b": 2}
    m.commit()
    assert m.committed == {"b": 2}


def test_merge_turns_a_staged_value_into_its_committed_form() -> None:
    m: PendingMap[str, tuple[str, bytes], bytes] = PendingMap(lambda _k, v: v[1])
    m.put("op", ("decoded", b"raw"))
    assert m.staged("op") == ("decoded", b"raw") and m.staged_keys() == ["op"]
    assert m.commit() == {"op": ("decoded", b"raw")}
    assert m.committed == {"op": b"raw"}


def test_forget_removes_a_key_committed_and_staged() -> None:
    m: PendingMap[str, int, int] = PendingMap(kept)
    m.committed["a"] = 1
    m.put("a", 2)
    m.forget("a")
    assert "a" not in m and m.commit() == {} and m.committed == {}
