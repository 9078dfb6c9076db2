"""An untyped pointer (void *) to a heap object whose type the update
changes, visited before the typed pointer that makes the migration replace
the object: the traversal cannot redirect it, so the update aborts naming
the pointer, its holder and the type (progs/untyped), and the old version
serves on with the pointer as it was."""

from fuprogs import Prog, assert_clean_stderr, build


def test_untyped_pointer_to_a_replaced_object_aborts_by_name():
    v1 = build("untyped", "v1")
    v2 = build("untyped", "v2", frm=v1)
    with Prog(v1) as p:
        before = p.dump()
        assert before == {"version": "1", "a": "41", "same": "1"}
        r = p.update(v2)
        assert r.returncode != 0, r.stdout
        for said in ("untyped pointer", "struct holder.peer", "struct node", "replaces"):
            assert said in r.stdout, (said, r.stdout)
        assert p.dump() == before
        assert p.quit() == 0
        assert_clean_stderr(p)
