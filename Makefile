# Everything a newcomer needs: `make demo` and `make test` set up .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
JARS_STAMP := $(VENV)/jars/.stamp
KAFKA_JARS_STAMP := $(VENV)/kafka-jars/.stamp
BENCH_STAMP := $(VENV)/.bench-stamp
CHROMIUM ?= /usr/bin/chromium
export JAVA_HOME ?= /usr/lib/jvm/java-17-openjdk-amd64
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: setup demo test lint bench ui clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing Eventide and its dependencies into $(VENV) (about a minute the first time)"
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# The JVM libraries of jvm/pom.xml (delta-spark, Spark's Kafka connector) from Maven Central, once,
# into $(VENV)/jars; runs and tests then reach no Maven repository.
$(JARS_STAMP): jvm/pom.xml $(STAMP)
	@echo "resolving the Delta and Kafka jars (jvm/pom.xml) into $(VENV)/jars"
	@rm -rf $(VENV)/jars
	@mvn -q -B -f jvm/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(VENV))/jars
	@$(PY) -c "from pathlib import Path; from transforms.lake.session import prune_jars; prune_jars(Path('$(VENV)/jars'))"
	@touch $(JARS_STAMP)

# Eventide's Hadoop local file system (jvm/localfs: permissions and links through java.nio, not a chmod or
# readlink process per file), compiled with the JDK's javac against pyspark's own Hadoop jar into $(VENV)/jars.
LOCALFS_JAR := $(VENV)/jars/eventide-localfs.jar
LOCALFS_SRC := $(wildcard jvm/localfs/eventide/hadoop/*.java)
$(LOCALFS_JAR): $(LOCALFS_SRC) $(JARS_STAMP)
	@echo "compiling jvm/localfs into $@"
	@rm -rf $(VENV)/localfs-classes
	@$(JAVA_HOME)/bin/javac -nowarn --release 17 -d $(VENV)/localfs-classes \
		-cp "$$($(PY) -c 'import pathlib, pyspark; print(pathlib.Path(pyspark.__file__).parent / "jars" / "*")')" $(LOCALFS_SRC)
	@$(JAVA_HOME)/bin/jar cf $@ -C $(VENV)/localfs-classes .

# Apache Kafka's broker (jvm/kafka/pom.xml) for `eventide kafka` and the tests, once, into a folder of its
# own, $(VENV)/kafka-jars: never on Spark's class path (the two need other versions of shared libraries).
$(KAFKA_JARS_STAMP): jvm/kafka/pom.xml
	@echo "resolving Apache Kafka's broker jars (jvm/kafka/pom.xml) into $(VENV)/kafka-jars"
	@rm -rf $(VENV)/kafka-jars
	@mvn -q -B -f jvm/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(VENV))/kafka-jars
	@touch $(KAFKA_JARS_STAMP)

# Debian's Chromium for the UI's browser test (tests/orchestration/test_ui_browser.py), driven by the
# playwright package of the dev extra: playwright's own browser download does not reach the network here.
$(CHROMIUM):
	@echo "installing Chromium (apt-get install chromium) for the UI's browser test"
	@apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
		|| (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null) \
		|| { echo "could not install Chromium with apt-get (it needs root and Debian's package lists):"; \
		     echo "install it as root with 'apt-get install -y chromium', or point CHROMIUM=/path/to/chromium at one"; \
		     exit 1; }

# The JVM's class cache (transforms/jvm_cache.py) is recorded by set-up, once per Java and jar set (about
# 30 s; a second's check after that): else the first JVM to start records it (the demo's, the tests'
# long-lived shared session) and the others start without it until that claim expires.
setup: $(STAMP) $(JARS_STAMP) $(LOCALFS_JAR) $(KAFKA_JARS_STAMP)
	@$(PY) -m transforms.record_jvm_cache

# The benchmarks' extra (Bytewax, for bench/peers.py): installed by `make bench` only.
$(BENCH_STAMP): pyproject.toml $(STAMP)
	@echo "installing the bench extra (bytewax) into $(VENV)"
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

demo: setup
	$(VENV)/bin/eventide demo

# Two xdist workers: the suite keeps both cores busy (3 workers: 28 min 9 s against 29 min 0 s, 2026-11-29).
# The project's bytecode is written first: hundreds of Python processes (runs, services, Spark's workers)
# import it, and under PYTHONDONTWRITEBYTECODE each would compile it again.
test: setup $(CHROMIUM)
	$(VENV)/bin/ruff check .
	@$(PY) -m compileall -q transforms orchestration assets examples windows
	$(PY) -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder -m 'not serial' --durations=25
	$(PY) -m pytest tests -m serial

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: setup $(BENCH_STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)

ui: setup
	$(VENV)/bin/eventide ui

clean:
	rm -rf .eventide
