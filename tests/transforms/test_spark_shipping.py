"""What a cluster's executors are sent of the registered apps' code, and the error when a task still
cannot import a module (the real cluster runs are in tests/orchestration/test_cluster.py)."""

import zipfile

from transforms.settings import Settings
from transforms.spark import explain_task_error, user_code_archive


def test_the_archive_holds_each_app_package_or_module_with_its_folder(tmp_path, monkeypatch):
    app_dir = tmp_path / "my-app"
    (app_dir / "helpers").mkdir(parents=True)
    (app_dir / "helpers" / "__init__.py").write_text("SCALE = 2\n")
    (app_dir / "units.py").write_text("def c(x):\n    return x\n")
    (app_dir / "notes.txt").write_text("not code")
    (app_dir / "temps.py").write_text(
        "from transforms.api import Application, DeltaSink, source, decoder\n"
        "import helpers, units\n"
        "@decoder\ndef d(p):\n    return {'v': p}\n"
        "app = Application('temps', source('temps', decoder=d).to_sink(DeltaSink('t')))\n")
    monkeypatch.chdir(app_dir)
    monkeypatch.syspath_prepend(str(app_dir))
    settings = Settings(home=tmp_path / "home", apps="examples.words:app,temps:app")
    with zipfile.ZipFile(user_code_archive(settings)) as z:
        names = set(z.namelist())
    assert {"temps.py", "units.py", "helpers/__init__.py", "examples/words.py", "examples/__init__.py"} <= names
    assert "notes.txt" not in names and not any("pyspark" in n or "__pycache__" in n for n in names)


def test_a_task_that_cannot_import_a_module_says_which_and_what_to_do():
    # As the driver sees it: Spark's error, with the executor's Python traceback inside.
    error = ("[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted ... "
             "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
             '  File "/work/main/transforms/api.py", line 37, in _load_by_reference\n'
             "ModuleNotFoundError: No module named 'sensors_lib'\n")
    said = explain_task_error(error)
    assert "could not import module 'sensors_lib'" in said and "install it into the Python that every worker runs" in said
    assert explain_task_error("ValueError: something else") is None
