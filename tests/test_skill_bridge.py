"""skill_bridge on the real filesystem: validation messages, publishing, the watchdog watcher,
agent authoring and the template. No mocks: tmp_path folders and a real Observer."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from skill_bridge import (MAX_SKILL_BYTES, MAX_SKILL_FILES, MAX_SKILL_MD_BYTES, Publisher,
                          SkillExists, SkillFormatError, SkillInvalid, SkillIssue, SkillNotFound,
                          SkillPathError, SkillWatcher, check_relpath, delete_skill, new_skill,
                          parse_front_matter, read_skill, skill_hash, validate_skill, write_skill)


def skill_md(name: str, desc: str = "Use when testing skill_bridge.", body: str = "Body.\n") -> str:
    return f"---\nname: {name}\ndescription: {desc}\n---\n\n{body}"


def make_skill(root: Path, name: str, text: str | None = None, files: dict | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if text is not False:
        (folder / "SKILL.md").write_text(skill_md(name) if text is None else text)
    for rel, content in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    """Poll until predicate() is truthy; the deadline is generous, the test never relies on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def snapshot(root: Path, dir_mtimes: bool = False) -> dict:
    """Every entry under root (hidden ones too): bytes + mtime for files, link targets, and
    folder mtimes if asked (staging folders legitimately come and go in the source)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            if p.is_symlink():
                out[p] = ("link", os.readlink(p))
            elif p.is_dir():
                out[p] = ("dir", st.st_mtime_ns if dir_mtimes else None)
            else:
                out[p] = (p.read_bytes(), st.st_mtime_ns)
    return out


def only(issues: list[SkillIssue]) -> SkillIssue:
    assert len(issues) == 1, [str(i) for i in issues]
    return issues[0]


def assert_names(issue: SkillIssue, file: str, *, line: int | None = None,
                 field: str | None = None, words: str = "") -> str:
    """The rendered message names the file, the line or field, and carries a fix."""
    text = str(issue)
    assert issue.file == file and text.startswith(file), text
    if line is not None:
        assert issue.line == line and f"{file}:{line}:" in text, text
    if field is not None:
        assert issue.field == field and f" {field}:" in text, text
    assert " — fix: " in text and issue.fix, text
    assert words.lower() in issue.message.lower(), text
    return text


# ---------------------------------------------------------------------------------------------
# validation: one test per error
# ---------------------------------------------------------------------------------------------

def test_valid_skill_passes_and_hidden_files_are_ignored(tmp_path):
    folder = make_skill(tmp_path, "ok-skill", files={
        "references/api.md": "x", "scripts/run.sh": "echo", "templates/t.txt": "t",
        "assets/logo.png": b"\x89PNG\x00\xff", ".SKILL.md.swp": b"\x00", ".DS_Store": b"\x00"})
    assert validate_skill(folder) == []


def test_bom_crlf_and_trailing_blanks_after_delimiters_are_accepted(tmp_path):
    text = "\ufeff---  \r\nname: crlf\r\ndescription: Use when lines end in CRLF.\r\n--- \r\nBody\r\n"
    folder = make_skill(tmp_path, "crlf", text)
    assert validate_skill(folder) == []
    meta, body_line = parse_front_matter(text)
    assert meta["name"] == "crlf" and body_line == 5


def test_issue_renders_file_line_field_and_fix():
    issue = SkillIssue("my-skill/SKILL.md", 3, "description", "is empty",
                       "write one sentence saying when to use the skill")
    assert str(issue) == ("my-skill/SKILL.md:3: description: is empty — fix: write one "
                          "sentence saying when to use the skill")
    assert issue.to_dict()["line"] == 3
    assert str(SkillIssue("a/SKILL.md", None, None, "is missing", "create it")) == \
        "a/SKILL.md: is missing — fix: create it"


def test_missing_skill_md(tmp_path):
    folder = make_skill(tmp_path, "no-md", text=False)
    assert_names(only(validate_skill(folder)), "no-md/SKILL.md", words="missing")


def test_no_front_matter(tmp_path):
    folder = make_skill(tmp_path, "bare", "# Just markdown\n")
    assert_names(only(validate_skill(folder)), "bare/SKILL.md", line=1, words="front matter")


def test_unterminated_front_matter(tmp_path):
    folder = make_skill(tmp_path, "open", "---\nname: open\ndescription: d\n# body\n")
    assert_names(only(validate_skill(folder)), "open/SKILL.md", line=1, words="never closed")


def test_yaml_syntax_error_reports_the_file_line(tmp_path):
    folder = make_skill(tmp_path, "bad-yaml", "---\nname: bad-yaml\ndescription: a: b\n---\n")
    text = assert_names(only(validate_skill(folder)), "bad-yaml/SKILL.md", line=3,
                        words="not valid YAML")
    assert "quote" in text


def test_parse_front_matter_raises_with_issue():
    with pytest.raises(SkillFormatError) as e:
        parse_front_matter("---\nname: x\n  bad: [\n---\n")
    assert e.value.issue.line is not None and "fix:" in str(e.value)


def test_front_matter_not_a_mapping(tmp_path):
    folder = make_skill(tmp_path, "listy", "---\n- a\n- b\n---\n")
    assert_names(only(validate_skill(folder)), "listy/SKILL.md", line=2, words="not a mapping")


def test_name_missing(tmp_path):
    folder = make_skill(tmp_path, "anon", "---\ndescription: Use when nameless.\n---\n")
    text = assert_names(only(validate_skill(folder)), "anon/SKILL.md", field="name",
                        words="missing")
    assert "name: anon" in text


def test_description_missing(tmp_path):
    folder = make_skill(tmp_path, "nodesc", "---\nname: nodesc\n---\n")
    assert_names(only(validate_skill(folder)), "nodesc/SKILL.md", field="description",
                 words="missing")


def test_name_empty(tmp_path):
    folder = make_skill(tmp_path, "empty-name", "---\nname: ''\ndescription: d\n---\n")
    assert_names(only(validate_skill(folder)), "empty-name/SKILL.md", line=2, field="name",
                 words="empty")


def test_description_empty(tmp_path):
    folder = make_skill(tmp_path, "my-skill", "---\nname: my-skill\ndescription:   \n---\n")
    issue = only(validate_skill(folder))
    assert str(issue) == ("my-skill/SKILL.md:3: description: is empty — fix: write one "
                          "sentence saying when to use the skill, as 'description: ...' in "
                          "the front matter")


def test_name_not_a_string(tmp_path):
    folder = make_skill(tmp_path, "num", "---\nname: 123\ndescription: d\n---\n")
    assert_names(only(validate_skill(folder)), "num/SKILL.md", line=2, field="name",
                 words="must be a string")


def test_description_not_a_string(tmp_path):
    folder = make_skill(tmp_path, "lst", "---\nname: lst\ndescription: [a, b]\n---\n")
    assert_names(only(validate_skill(folder)), "lst/SKILL.md", line=3, field="description",
                 words="must be a string")


def test_description_too_long(tmp_path):
    folder = make_skill(tmp_path, "long-desc", skill_md("long-desc", desc="x" * 1025))
    assert_names(only(validate_skill(folder)), "long-desc/SKILL.md", line=3,
                 field="description", words="over the 1024")


@pytest.mark.parametrize("bad", ["My-Skill", "a_b", "-ab", "ab-", "a--b", "a" * 65, "a b"])
def test_name_not_matching_the_rule(tmp_path, bad):
    folder = make_skill(tmp_path, "folder", skill_md(f"'{bad}'"))
    text = assert_names(only(validate_skill(folder)), "folder/SKILL.md", line=2, field="name",
                        words="not a valid skill name")
    assert "lowercase" in text


def test_name_differs_from_folder(tmp_path):
    folder = make_skill(tmp_path, "folder-name", skill_md("other-name"))
    text = assert_names(only(validate_skill(folder)), "folder-name/SKILL.md", line=2,
                        field="name", words="does not match the folder")
    assert "rename the folder" in text


def test_unexpected_file_beside_skill_md(tmp_path):
    folder = make_skill(tmp_path, "extra", files={"notes.txt": "n"})
    assert_names(only(validate_skill(folder)), "extra/notes.txt", words="unexpected file")


def test_unexpected_folder_beside_skill_md(tmp_path):
    folder = make_skill(tmp_path, "extra-dir", files={"docs/a.md": "n"})
    text = assert_names(only(validate_skill(folder)), "extra-dir/docs",
                        words="unexpected folder")
    assert "references/" in text


def test_symlink_is_refused(tmp_path):
    folder = make_skill(tmp_path / "src", "linky", files={"references/real.md": "r"})
    (tmp_path / "secret").write_text("s")
    (folder / "references" / "link.md").symlink_to(tmp_path / "secret")
    assert_names(only(validate_skill(folder)), "linky/references/link.md", words="symlink")


def test_skill_folder_itself_a_symlink_or_file(tmp_path):
    real = make_skill(tmp_path / "elsewhere", "real")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "real").symlink_to(real)
    assert_names(only(validate_skill(tmp_path / "src" / "real")), "real", words="symlink")
    (tmp_path / "src" / "stray.txt").write_text("x")
    assert_names(only(validate_skill(tmp_path / "src" / "stray.txt")), "stray.txt",
                 words="not a folder")


def test_special_file_is_refused(tmp_path):
    folder = make_skill(tmp_path, "fifo", files={"assets/a.txt": "a"})
    os.mkfifo(folder / "assets" / "pipe")
    assert_names(only(validate_skill(folder)), "fifo/assets/pipe", words="not a regular file")


def test_skill_md_too_large(tmp_path):
    folder = make_skill(tmp_path, "big-md", skill_md("big-md", body="x" * MAX_SKILL_MD_BYTES))
    assert_names(only(validate_skill(folder)), "big-md/SKILL.md", words="byte limit")


def test_skill_total_size_too_large(tmp_path):
    folder = make_skill(tmp_path, "big-skill")
    (folder / "assets").mkdir()
    with open(folder / "assets" / "blob.bin", "wb") as f:
        f.truncate(MAX_SKILL_BYTES + 1)  # sparse: cheap to make, counted by its size
    assert_names(only(validate_skill(folder)), "big-skill", words="byte limit")


def test_too_many_files(tmp_path):
    folder = make_skill(tmp_path, "many", files={f"references/{i}.md": "" for i in
                                                 range(MAX_SKILL_FILES)})
    assert_names(only(validate_skill(folder)), "many", words="file limit")


def test_skill_md_not_utf8(tmp_path):
    folder = make_skill(tmp_path, "latin")
    (folder / "SKILL.md").write_bytes(skill_md("latin").encode() + b"caf\xe9\n")
    assert_names(only(validate_skill(folder)), "latin/SKILL.md", line=7, words="not UTF-8")


def test_every_problem_is_reported_not_just_the_first(tmp_path):
    folder = make_skill(tmp_path, "multi", "---\nname: Other\n---\n", files={"x.txt": "x"})
    fields = {(i.file, i.field) for i in validate_skill(folder)}
    assert fields == {("multi/SKILL.md", "name"), ("multi/SKILL.md", "description"),
                      ("multi/x.txt", None)}


# ---------------------------------------------------------------------------------------------
# publisher
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def dirs(tmp_path):
    source, target = tmp_path / "source", tmp_path / "workspace" / "skills"
    source.mkdir()
    return source, target


def test_publish_then_unchanged_then_unpublish(dirs):
    source, target = dirs
    make_skill(source, "alpha", files={"scripts/run.sh": "echo hi"})
    os.chmod(source / "alpha" / "scripts" / "run.sh", 0o755)
    pub = Publisher(source, target)
    [r] = pub.sync()
    assert r.status == "published" and r.hash == r.published_hash == skill_hash(source / "alpha")
    assert (target / "alpha" / "SKILL.md").read_bytes() == (source / "alpha" / "SKILL.md").read_bytes()
    assert os.access(target / "alpha" / "scripts" / "run.sh", os.X_OK)
    assert set(pub.managed()) == {"alpha"}
    assert json.loads((target / ".clawrl-published.json").read_text())["skills"]["alpha"]["hash"] == r.hash
    assert pub.reconcile("alpha").status == "unchanged"
    os.chmod(source / "alpha" / "scripts" / "run.sh", 0o644)  # the exec bit is content
    assert pub.reconcile("alpha").status == "published"
    shutil.rmtree(source / "alpha")
    assert [r.status for r in pub.sync()] == ["unpublished"]
    assert not (target / "alpha").exists() and pub.managed() == {}
    assert [p.name for p in target.iterdir()] == [".clawrl-published.json"]


def test_an_applied_change_reports_its_own_transition_even_when_the_watcher_fires_at_once(dirs):
    """The daemon's endpoint deletes or writes a skill and answers with what that did. A watcher
    reconcile that fires between the write and the endpoint's reconcile would take the transition
    and leave the endpoint "unchanged" (seen in CI); apply() holds it off until the change is
    reconciled."""
    source, target = dirs
    make_skill(source, "alpha")
    pub = Publisher(source, target)
    assert pub.reconcile("alpha").status == "published"
    watcher_saw: list[str] = []
    watcher = threading.Thread(target=lambda: watcher_saw.append(pub.reconcile("alpha").status))

    def delete():
        shutil.rmtree(source / "alpha")
        watcher.start()         # the watcher's event for the deletion, at the worst moment
        watcher.join(0.3)       # it must not get through while the change is being applied

    assert pub.apply("alpha", delete).status == "unpublished"
    watcher.join(5)
    assert watcher_saw == ["unchanged"] and not (target / "alpha").exists()

    def broken():
        raise SkillPathError("refused before writing")
    with pytest.raises(SkillPathError):
        pub.apply("alpha", broken)
    assert pub.managed() == {}


def test_invalid_source_keeps_last_valid_version(dirs):
    source, target = dirs
    make_skill(source, "beta")
    pub = Publisher(source, target)
    good = pub.reconcile("beta")
    before = snapshot(target / "beta")
    (source / "beta" / "SKILL.md").write_text("---\nname: beta\n---\n")
    r = pub.reconcile("beta")
    assert r.status == "error" and r.published_hash == good.hash and r.issues
    assert r.to_dict()["issues"][0]["field"] == "description"
    assert snapshot(target / "beta") == before


def test_never_published_invalid_skill_is_not_published(dirs):
    source, target = dirs
    make_skill(source, "gamma", "no front matter")
    r = Publisher(source, target).reconcile("gamma")
    assert r.status == "error" and r.published_hash is None
    assert not (target / "gamma").exists()


def test_foreign_skill_is_a_conflict_and_untouched(dirs):
    source, target = dirs
    make_skill(target, "foreign", skill_md("foreign", desc="Someone else's skill."))
    before = snapshot(target)
    make_skill(source, "foreign")
    pub = Publisher(source, target)
    [r] = pub.sync()
    assert r.status == "conflict" and "rename" in str(r.issues[0])
    assert {k: v for k, v in snapshot(target).items() if "clawrl" not in k.name} == before
    assert pub.managed() == {}


def test_target_repairs_and_leftovers(dirs):
    source, target = dirs
    make_skill(source, "delta")
    pub = Publisher(source, target)
    pub.sync()
    (target / ".clawrl-stage-crashed" / "delta").mkdir(parents=True)
    shutil.rmtree(target / "delta")  # someone removed the live copy: it comes back
    [r] = pub.sync()
    assert r.status == "published" and (target / "delta" / "SKILL.md").exists()
    assert not (target / ".clawrl-stage-crashed").exists()


def test_corrupt_manifest_is_a_clear_error(dirs):
    source, target = dirs
    target.mkdir(parents=True)
    (target / ".clawrl-published.json").write_text("{nope")
    make_skill(source, "eps")
    with pytest.raises(ValueError, match="fix:"):
        Publisher(source, target).reconcile("eps")


def test_overlapping_folders_are_refused(tmp_path):
    for source, target in [(tmp_path, tmp_path), (tmp_path, tmp_path / "skills"),
                           (tmp_path / "src", tmp_path)]:
        with pytest.raises(ValueError, match="separate folders"):
            Publisher(source, target)


def test_reconcile_refuses_hidden_or_path_names(dirs):
    pub = Publisher(*dirs)
    for bad in [".hidden", "a/b", "..", ""]:
        with pytest.raises(ValueError):
            pub.reconcile(bad)


# ---------------------------------------------------------------------------------------------
# watcher: the whole lifecycle against a real watchdog observer
# ---------------------------------------------------------------------------------------------

class Results:
    def __init__(self):
        self.items, self.lock = [], threading.Lock()

    def __call__(self, result):
        with self.lock:
            self.items.append(result)

    def since(self, mark: int, name: str, status: str | None = None) -> list:
        with self.lock:
            return [r for r in self.items[mark:]
                    if r.name == name and (status is None or r.status == status)]

    def mark(self) -> int:
        with self.lock:
            return len(self.items)


def test_watcher_lifecycle(dirs):
    source, target = dirs
    make_skill(target, "foreign", skill_md("foreign", desc="Installed by hand."))
    (target / "README.txt").write_text("a stray file")
    foreign_before = snapshot(target, dir_mtimes=True)
    results = Results()
    watcher = SkillWatcher(Publisher(source, target), debounce_s=0.3, on_result=results)
    watcher.start()
    try:
        live = target / "alpha" / "SKILL.md"
        # create -> published, content equal
        make_skill(source, "alpha")
        wait_for(lambda: live.read_bytes() == (source / "alpha" / "SKILL.md").read_bytes(),
                 what="alpha published")

        # ten rapid writes -> debounced to (about) one publish of the last one
        mark = results.mark()
        for i in range(10):
            (source / "alpha" / "SKILL.md").write_text(skill_md("alpha", body=f"v{i}\n"))
            time.sleep(0.02)
        final = skill_md("alpha", body="v9\n").encode()
        wait_for(lambda: live.read_bytes() == final, what="final write published")
        wait_for(lambda: results.since(mark, "alpha", "published"), what="publish reported")
        published = results.since(mark, "alpha", "published")
        assert 1 <= len(published) <= 3, [r.status for r in results.since(mark, "alpha")]
        assert published[-1].hash == skill_hash(source / "alpha")

        # break it -> error with the line; the last valid version stays live
        mark = results.mark()
        (source / "alpha" / "SKILL.md").write_text("---\nname: alpha\ndescription: a: b\n---\n")
        [err] = wait_for(lambda: results.since(mark, "alpha", "error"), what="error reported")[-1:]
        assert err.issues[0].line == 3 and err.issues[0].file == "alpha/SKILL.md"
        assert live.read_bytes() == final

        # fix -> republished
        fixed = skill_md("alpha", body="fixed\n").encode()
        (source / "alpha" / "SKILL.md").write_bytes(fixed)
        wait_for(lambda: live.read_bytes() == fixed, what="fixed version published")

        # rename the folder and its name field -> old unpublished, new published
        mark = results.mark()
        os.rename(source / "alpha", source / "beta")
        (source / "beta" / "SKILL.md").write_text(skill_md("beta"))
        wait_for(lambda: results.since(mark, "alpha", "unpublished"), what="alpha unpublished")
        wait_for(lambda: (target / "beta" / "SKILL.md").read_text() == skill_md("beta"),
                 what="beta published")
        assert not (target / "alpha").exists()

        # a source skill named like the foreign one -> conflict, foreign untouched
        mark = results.mark()
        make_skill(source, "foreign")
        wait_for(lambda: results.since(mark, "foreign", "conflict"), what="conflict reported")

        # delete -> unpublished
        shutil.rmtree(source / "beta")
        wait_for(lambda: not (target / "beta").exists(), what="beta unpublished")
        assert set(watcher.publisher.managed()) == set()
        after = snapshot(target, dir_mtimes=True)
        assert {k: v for k, v in after.items() if k.name != ".clawrl-published.json"} \
            == foreign_before
    finally:
        watcher.stop()


def test_watcher_survives_failing_reconcile_and_callback(dirs, caplog):
    source, target = dirs
    calls = []

    def flaky(result):
        calls.append(result)
        if len(calls) == 1:
            raise RuntimeError("callback bug")

    def logged(text):
        return lambda: any(text in r.getMessage() for r in caplog.records)

    make_skill(source, "first")
    watcher = SkillWatcher(Publisher(source, target), debounce_s=0.05, on_result=flaky)
    with caplog.at_level("WARNING", logger="skill_bridge"):
        watcher.start()  # the first report raises inside on_result: logged, not raised
        try:
            assert logged("on_result callback failed")()
            manifest = target / ".clawrl-published.json"
            good = manifest.read_bytes()
            manifest.write_text("{broken")  # every reconcile now raises
            make_skill(source, "second")
            wait_for(logged("reconciling skill 'second' failed"), what="failure logged")
            manifest.write_bytes(good)
            (source / "second" / "SKILL.md").write_text(skill_md("second", body="again\n"))
            wait_for(lambda: (target / "second" / "SKILL.md").exists(),
                     what="watcher still alive")
        finally:
            watcher.stop()


# ---------------------------------------------------------------------------------------------
# author
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("relpath", [
    "../x", "/etc/passwd", "references/../../x", "SKILL.md/..", "references\\x.md",
    "refer\0ences/x.md", "notes.txt", "references/", "references", ".git/config",
    "references/.hidden", "./SKILL.md", "references//x.md", "", "docs/x.md"])
def test_bad_relpaths_are_refused(tmp_path, relpath):
    source = tmp_path / "source"
    make_skill(source, "s")
    before = snapshot(tmp_path)
    with pytest.raises(SkillPathError, match="fix|must"):
        check_relpath(relpath)
    with pytest.raises(SkillPathError):
        write_skill(source, "s", {relpath: "x"}, create=False)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "A B", "a/b", "a" * 65, "", "-x", "x_y",
                                  "../outside"])
def test_bad_names_are_refused(tmp_path, name):
    source = tmp_path / "source"
    source.mkdir()
    before = snapshot(tmp_path)
    for call in (lambda: write_skill(source, name, {"SKILL.md": skill_md("x")}, create=True),
                 lambda: write_skill(source, name, {"SKILL.md": skill_md("x")}, create=False),
                 lambda: delete_skill(source, name), lambda: read_skill(source, name),
                 lambda: new_skill(source, name)):
        with pytest.raises(SkillPathError):
            call()
    assert snapshot(tmp_path) == before


def test_symlinked_subfolder_pointing_outside_is_refused(tmp_path):
    source, outside = tmp_path / "source", tmp_path / "outside"
    outside.mkdir()
    folder = make_skill(source, "s")
    (folder / "references").symlink_to(outside, target_is_directory=True)
    before = snapshot(tmp_path)
    with pytest.raises(SkillPathError, match="symlink"):
        write_skill(source, "s", {"references/x.md": "escape"}, create=False)
    assert snapshot(tmp_path) == before and list(outside.iterdir()) == []


def test_symlinked_skill_folder_is_refused(tmp_path):
    source, elsewhere = tmp_path / "source", make_skill(tmp_path / "elsewhere", "s")
    source.mkdir()
    (source / "s").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(tmp_path)
    with pytest.raises(SkillPathError, match="symlink"):
        write_skill(source, "s", {"references/x.md": "x"}, create=False)
    with pytest.raises(SkillPathError):
        delete_skill(source, "s")
    assert snapshot(tmp_path) == before


def test_create_patch_read_delete(tmp_path):
    source = tmp_path / "source"
    path = write_skill(source, "notes", {"SKILL.md": skill_md("notes"),
                                         "references/a.md": "A1"}, create=True)
    assert path == source / "notes" and validate_skill(path) == []
    with pytest.raises(SkillExists):
        write_skill(source, "notes", {"SKILL.md": skill_md("notes")}, create=True)
    with pytest.raises(SkillNotFound):
        write_skill(source, "ghost", {"SKILL.md": skill_md("ghost")}, create=False)
    write_skill(source, "notes", {"references/a.md": "A2", "scripts/b.sh": "echo"}, create=False)
    assert read_skill(source, "notes") == {"SKILL.md": skill_md("notes"),
                                           "references/a.md": "A2", "scripts/b.sh": "echo"}
    assert [p.name for p in source.iterdir()] == ["notes"]  # no staging left behind
    delete_skill(source, "notes")
    assert list(source.iterdir()) == []
    with pytest.raises(SkillNotFound):
        delete_skill(source, "notes")
    with pytest.raises(SkillNotFound):
        read_skill(source, "notes")


def test_invalid_create_or_patch_changes_nothing(tmp_path):
    source = tmp_path / "source"
    write_skill(source, "keep", {"SKILL.md": skill_md("keep")}, create=True)
    before = snapshot(tmp_path)
    with pytest.raises(SkillInvalid) as e:
        write_skill(source, "keep", {"SKILL.md": "---\nname: keep\ndescription: a: b\n---\n",
                                     "references/new.md": "n"}, create=False)
    assert e.value.issues[0].line == 3 and "keep/SKILL.md:3" in str(e.value)
    with pytest.raises(SkillInvalid):
        write_skill(source, "fresh", {"references/only.md": "no SKILL.md"}, create=True)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# template
# ---------------------------------------------------------------------------------------------

def test_new_skill_template_validates(tmp_path):
    source = tmp_path / "source"
    folder = new_skill(source, "pdf-summary")
    assert validate_skill(folder) == []
    text = (folder / "SKILL.md").read_text()
    assert "## When to use" in text and "## Steps" in text and "## Examples" in text
    quoted = new_skill(source, "tricky", description="Use when: the text has a colon")
    assert validate_skill(quoted) == []
    assert parse_front_matter((quoted / "SKILL.md").read_text())[0]["description"] == \
        "Use when: the text has a colon"
    with pytest.raises(SkillExists):
        new_skill(source, "pdf-summary")
