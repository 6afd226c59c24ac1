"""Issue L's ninth sitting: bronze for landed log lines with the decode in Python (Eventide's bronze
application) or in Spark SQL expressions, one cold process each (issue-l-2026-11-29c.txt).

    EVENTIDE_HOME=<a copy of a landed home> EVENTIDE_APPS=examples.logs:app \
        python bench/results/issue-l-2026-11-29-sql-decode-estimate.py python|sql|sqlsplit

An estimate, not Eventide's code: the SQL forms skip the quarantine and the one-line form's checks."""

import sys
import time

T0 = time.time()
mode = sys.argv[1]
from transforms.settings import Settings  # noqa: E402 - after T0: the imports count
from transforms.spark import get_spark  # noqa: E402

s = Settings.from_env()
spark = get_spark(s)
t1 = time.time()
if mode == "python":
    from transforms.engine import run_application
    from transforms.streams import bronze_application
    reps = run_application(spark, bronze_application("logs"), s)
    n = sum(r.input_rows for r in reps)
else:
    from pyspark.sql import functions as F

    from transforms.ingestion.landing import LANDING_DDL
    src = (spark.readStream.schema(LANDING_DDL).option("basePath", str(s.home.absolute()))
           .parquet(str((s.landing / "logs").absolute())))
    line = F.regexp_replace(F.col("payload").cast("string"), "[\\r\\n]+$", "")
    clf = r'^([^\t\n\f\r ]+) ([^\t\n\f\r ]+) ([^\t\n\f\r ]+) \[([0-9]{2}/[A-Z][a-z]{2}/[0-9]{4}:[0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4})\] "([^"]*)" ([0-9]{3}) ([0-9]+|-)$'
    if mode == "sql":
        ts = F.regexp_extract(line, clf, 4)
        req = F.regexp_extract(line, clf, 5)
        host, ident, user = (F.regexp_extract(line, clf, i) for i in (1, 2, 3))
        status, nbytes = F.regexp_extract(line, clf, 6), F.regexp_extract(line, clf, 7)
    else:  # sqlsplit: one match-only test, then split at the fixed places
        ok = line.rlike(clf)
        parts = F.split(line, " ")
        lb = F.instr(line, "[")
        ts = F.when(ok, F.substring(line, lb + 1, 26))
        q1 = F.instr(line, '"')
        rest = F.substring(line, q1 + 1, 1 << 20)
        req = F.when(ok, F.substring_index(rest, '"', 1))
        host, ident, user = (F.when(ok, parts[i]) for i in (0, 1, 2))
        tail = F.substring_index(line, '" ', -1)
        status, nbytes = F.when(ok, F.substring_index(tail, " ", 1)), F.when(ok, F.substring_index(tail, " ", -1))
    out = src.select(
        "stream", "seq", "receive_time",
        F.when(line == "END_OF_DAY", "marker").otherwise("line").alias("kind"),
        host.alias("host"), ident.alias("ident"), user.alias("user"),
        F.try_to_timestamp(ts, F.lit("dd/MMM/yyyy:HH:mm:ss Z")).alias("timestamp"),
        F.try_to_timestamp(F.substring(ts, 1, 11), F.lit("dd/MMM/yyyy")).cast("date").alias("day"),
        F.substring_index(req, " ", 1).alias("method"), F.substring_index(F.substring_index(req, " ", 2), " ", -1).alias("path"),
        status.try_cast("int").alias("status"), nbytes.try_cast("long").alias("bytes"))
    path = str((s.home / "lake" / "bronze_sql").absolute())
    counted = []
    def write(df, bid):
        df.write.format("delta").mode("append").option("txnAppId", "x").option("txnVersion", bid).save(path)
        counted.append(1)
    q = (out.writeStream.foreachBatch(write).option("checkpointLocation", str((s.home / "ck").absolute()))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    n = sum(p["numInputRows"] for p in q.recentProgress)
t2 = time.time()
print(f"{mode}: session {t1-T0:.2f} s, bronze {t2-t1:.2f} s, {n} rows, whole {t2-T0:.2f} s", file=sys.stderr, flush=True)
