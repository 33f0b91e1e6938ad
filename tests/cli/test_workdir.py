"""What a working directory's package holds: .gitignore and .mantaignore honoured, .git never,
the same bytes for the same files."""

from __future__ import annotations

import io
import os
import stat
import zipfile

import pytest
from manta import ignore
from manta.workdir import package_files, package_working_dir

TREE = {
    ".git/config": "[core]\n",
    ".git/objects/ab/cdef": "blob",
    ".gitignore": "# build output\n*.log\n!keep.log\nbuild/\n/top-only.txt\n\ndocs/**/*.tmp\n",
    ".mantaignore": "data/\n!important.log\n",
    "a.py": "print('a')\n",
    "keep.log": "kept by a ! line\n",
    "debug.log": "left out\n",
    "important.log": ".mantaignore has the last word\n",
    "build/out.bin": "left out\n",
    "src/build": "a file called build: build/ is for directories\n",
    "top-only.txt": "left out: anchored at the root\n",
    "src/top-only.txt": "kept: the pattern is anchored at the root\n",
    "src/.gitignore": "secret.txt\n",
    "src/secret.txt": "left out by src/.gitignore\n",
    "secret.txt": "kept: src/.gitignore applies below src only\n",
    "docs/readme.md": "kept\n",
    "docs/x.tmp": "left out: ** matches no directory too\n",
    "docs/a/b/x.tmp": "left out\n",
    "data/big.csv": "left out by .mantaignore\n",
    "sub/.git": "gitdir: ../.git/worktrees/sub\n",
    "sub/code.py": "kept\n",
    "run.sh": "#!/bin/sh\necho hi\n",
}
EXPECTED = [
    ".gitignore",
    ".mantaignore",
    "a.py",
    "docs/readme.md",
    "important.log",
    "keep.log",
    "run.sh",
    "secret.txt",
    "src/.gitignore",
    "src/build",
    "src/top-only.txt",
    "sub/code.py",
]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "project"
    for name, text in TREE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "run.sh").chmod(0o755)
    os.symlink("a.py", root / "alias.py")
    return root


def test_ignore_files_and_git_decide_what_goes_in(tree):
    files, links = package_files(tree)
    assert files == EXPECTED
    assert links == ["alias.py"]


def test_the_zip_holds_exactly_those_files_with_their_modes(tree):
    package = package_working_dir(tree)
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        assert archive.namelist() == EXPECTED
        assert archive.read("src/top-only.txt") == TREE["src/top-only.txt"].encode()
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in archive.infolist()}
    assert modes["run.sh"] == 0o755 and modes["a.py"] == 0o644
    assert not any(".git" in name.split("/") for name in package.files)


def test_the_same_files_make_the_same_sha256(tree):
    first = package_working_dir(tree)
    os.utime(tree / "a.py", (1, 1))
    assert package_working_dir(tree).sha256 == first.sha256
    (tree / "a.py").write_text("print('b')\n")
    assert package_working_dir(tree).sha256 != first.sha256
    (tree / "more.log").write_text("ignored content changes nothing\n")
    (tree / "a.py").write_text("print('a')\n")
    assert package_working_dir(tree).sha256 == first.sha256


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "expected"),
    [
        ("*.pyc", "a/b/c.pyc", False, True),
        ("*.pyc", "a/b/c.py", False, None),
        ("/top", "top", False, True),
        ("/top", "a/top", False, None),
        ("a/b", "a/b", False, True),
        ("a/b", "x/a/b", False, None),
        ("**/cache", "cache", True, True),
        ("**/cache", "x/y/cache", True, True),
        ("a/**/b", "a/b", False, True),
        ("a/**/b", "a/x/y/b", False, True),
        ("out/**", "out/x/y", False, True),
        ("out/**", "out", True, None),
        ("logs/", "logs", False, None),
        ("logs/", "x/logs", True, True),
        ("file?.txt", "file1.txt", False, True),
        ("file?.txt", "file10.txt", False, None),
        ("[!a]b", "cb", False, True),
        ("[!a]b", "ab", False, None),
        ("[]x]y", "]y", False, True),
        ("\\#hash", "#hash", False, True),
        ("\\!bang", "!bang", False, True),
        ("!kept", "kept", False, False),
        ("trailing   ", "trailing", False, True),
        ("space\\ ", "space ", False, True),
        ("# comment", "# comment", False, None),
    ],
)
def test_gitignore_patterns_without_pathspec(pattern, path, is_dir, expected):
    rules = ignore.IgnoreFile("", [pattern], use_pathspec=False)
    assert rules.verdict(path, is_dir) is expected


def test_a_nested_ignore_file_applies_below_its_directory_only():
    rules = ignore.IgnoreFile("src", ["*.tmp", "/only-here"], use_pathspec=False)
    assert rules.verdict("src/a.tmp", False) is True
    assert rules.verdict("src/deep/a.tmp", False) is True
    assert rules.verdict("a.tmp", False) is None
    assert rules.verdict("src/only-here", False) is True
    assert rules.verdict("src/x/only-here", False) is None


@pytest.mark.skipif(ignore._pathspec is None, reason="pathspec is not importable here")
def test_pathspec_and_the_fallback_agree(tree, monkeypatch):
    with_pathspec = package_files(tree)
    monkeypatch.setattr(ignore, "_pathspec", None)
    assert package_files(tree) == with_pathspec
