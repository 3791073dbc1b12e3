"""Spark's side of ``s3://`` roots: Hadoop's S3A file system for the streaming checkpoints.

Only a session whose checkpoint or table root is on S3 loads it. ``hadoop-aws`` is taken at the
Hadoop version the installed pyspark bundles (read off its ``hadoop-client-api`` jar, so another
Spark brings its own), with the few AWS SDK v2 modules S3A uses instead of the SDK's ~600 MB
``bundle``; Maven resolves them once into ``~/.m2`` (pipeline/jvm.py). The S3 settings are those
``[storage.s3]`` resolved (pipeline/objstore.py), handed to S3A and to the executors' environment.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline import objstore
from pipeline.jvm import JvmError, maven_classpath

SDK_BUNDLE = "software.amazon.awssdk:bundle"
# What S3A itself calls of the SDK: the S3 client, its transfer manager (uploads, copies), STS (for
# role credentials); their own dependencies (HTTP clients, auth) come with them.
SDK_MODULES = ("s3", "s3-transfer-manager", "sts")


def hadoop_version() -> str:
    """The Hadoop version of the installed pyspark, from its ``hadoop-client-api-X.jar``."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        found = re.fullmatch(r"hadoop-client-api-(.+)\.jar", jar.name)
        if found:
            return found.group(1)
    raise JvmError(f"no hadoop-client-api-*.jar under {jars}: cannot tell which hadoop-aws this Spark needs")


def _sdk_version(hadoop: str) -> str:
    """The AWS SDK v2 version Hadoop ``hadoop`` was built with (its ``hadoop-project`` pom says)."""
    pom = (Path.home() / ".m2" / "repository" / "org" / "apache" / "hadoop" / "hadoop-project" / hadoop
           / f"hadoop-project-{hadoop}.pom")
    if not pom.exists():  # Maven fetches it with hadoop-aws's own pom
        maven_classpath(f"hadoop-aws-pom-{hadoop}", [f"org.apache.hadoop:hadoop-aws:{hadoop}"],
                        exclusions=[SDK_BUNDLE])
    found = re.search(r"<aws-java-sdk-v2\.version>([^<]+)</aws-java-sdk-v2\.version>", pom.read_text())
    if not found:
        raise JvmError(f"{pom} names no aws-java-sdk-v2.version: cannot pick the AWS SDK for hadoop-aws {hadoop}")
    return found.group(1)


def s3a_jars() -> list[Path]:
    """hadoop-aws for this Spark's Hadoop and the SDK modules it needs (resolved once, then cached)."""
    hadoop = hadoop_version()
    sdk = _sdk_version(hadoop)
    artifacts = [f"org.apache.hadoop:hadoop-aws:{hadoop}",
                 *(f"software.amazon.awssdk:{m}:{sdk}" for m in SDK_MODULES)]
    return maven_classpath(f"s3a-{hadoop}", artifacts, exclusions=[SDK_BUNDLE])


def spark_conf(root: str, checkpoint_root: str) -> dict[str, str]:
    """Session settings for S3A when either root is on S3 (none otherwise)."""
    if not (objstore.is_remote(root) or objstore.is_remote(checkpoint_root)):
        return {}
    options = objstore.storage_options("s3://settings") or {}
    jars = ",".join(str(j) for j in s3a_jars())
    conf = {
        "spark.jars": jars,
        "spark.hadoop.fs.s3a.access.key": options["AWS_ACCESS_KEY_ID"],
        "spark.hadoop.fs.s3a.secret.key": options["AWS_SECRET_ACCESS_KEY"],
        "spark.hadoop.fs.s3a.endpoint.region": options["AWS_REGION"],
        # the executors' Python workers write the tables' files with pyarrow (pipeline/objstore.py)
        f"spark.executorEnv.{objstore.ENV_OPTIONS}": json.dumps(options),
    }
    if "AWS_SESSION_TOKEN" in options:
        conf["spark.hadoop.fs.s3a.session.token"] = options["AWS_SESSION_TOKEN"]
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
    else:
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    endpoint = options.get("AWS_ENDPOINT_URL")
    if endpoint:  # an S3-compatible server: bucket in the path, not the host name
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "true" if endpoint.startswith("https") else "false"
    return conf  # [spark.conf] may override any of these


if __name__ == "__main__":  # scripts/bootstrap.sh: fetch the jars now, so no test waits for Maven
    found = s3a_jars()
    print(f"s3a: hadoop-aws {hadoop_version()} and {len(found)} jars "
          f"({sum(j.stat().st_size for j in found) / 1e6:.0f} MB) resolved")
