"""Image build step: add hadoop-aws and the AWS SDK bundle to pyspark's jars (s3a://).

Run by the Dockerfile with its build arguments in the environment. WITH_S3A=false (the
default) does nothing. With WITH_S3A=true, hadoop-aws must be the exact Hadoop release
inside pyspark's jars and the AWS SDK bundle the one that release was built against;
both are verified against sha256 values given at build time, and nothing unverified is
kept. A script rather than a heredoc RUN: buildah 1.28 (podman 4.3) has no heredocs.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import sys
import urllib.request


def main() -> None:
    with_s3a = os.environ.get("WITH_S3A", "false")
    if with_s3a == "false":
        return
    if with_s3a != "true":
        sys.exit(f"WITH_S3A must be true or false, not {with_s3a!r}")
    import pyspark

    jars = pathlib.Path(pyspark.__file__).parent / "jars"
    hadoop = os.environ["HADOOP_AWS_VERSION"]
    shipped = [
        m.group(1)
        for p in jars.iterdir()
        if (m := re.fullmatch(r"hadoop-client-api-(.*)\.jar", p.name))
    ]
    if shipped != [hadoop]:
        sys.exit(
            f"pyspark ships Hadoop {', '.join(shipped) or 'none'}, not {hadoop}: set "
            "HADOOP_AWS_VERSION (and its AWS SDK bundle) or PYSPARK_VERSION"
        )
    sha_aws, sha_sdk = os.environ["HADOOP_AWS_SHA256"], os.environ["AWS_SDK_BUNDLE_SHA256"]
    if not sha_aws or not sha_sdk:
        sys.exit(
            "WITH_S3A=true needs HADOOP_AWS_SHA256 and AWS_SDK_BUNDLE_SHA256 "
            "(see docs/deployment.md)"
        )
    maven, sdk = os.environ["MAVEN_REPOSITORY"], os.environ["AWS_SDK_BUNDLE_VERSION"]
    downloads = [
        (f"{maven}/org/apache/hadoop/hadoop-aws/{hadoop}/hadoop-aws-{hadoop}.jar", sha_aws),
        (f"{maven}/software/amazon/awssdk/bundle/{sdk}/bundle-{sdk}.jar", sha_sdk),
    ]
    for url, expected in downloads:
        target = jars / url.rsplit("/", 1)[1]
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=60) as response, target.open("wb") as out:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected.lower():
            target.unlink()
            sys.exit(f"{url}: sha256 {digest.hexdigest()} does not match {expected}")
        print(f"added {target.name} ({target.stat().st_size} bytes, sha256 verified)")


if __name__ == "__main__":
    main()
