"""The JVM's start-up lines that a job's output must not hold."""

from __future__ import annotations

import re

#: Spark's log4j notice (it came twice), its default log level notice, the hostname warning
#: and Hadoop's native-library warning.
STARTUP_CHATTER = re.compile(
    r"log4j profile|Setting default log level|sc\.setLogLevel|resolves to a loopback address|"
    r"SPARK_LOCAL_IP|native-hadoop"
)
