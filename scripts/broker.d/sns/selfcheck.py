"""A round trip through SNS into SQS on a local moto server: a topic, a queue subscribed to it with raw
message delivery, a publish with an attribute, and the message received from the queue. Exit status 0
when it arrived intact; the topic and queue are deleted again."""

import sys
import uuid

import boto3

endpoint = sys.argv[1]
settings = dict(
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="local",
    aws_secret_access_key="local",
)
sns = boto3.client("sns", **settings)
sqs = boto3.client("sqs", **settings)
name = "brokers-selfcheck-" + uuid.uuid4().hex[:8]
topic = sns.create_topic(Name=name)["TopicArn"]
queue = sqs.create_queue(QueueName=name)["QueueUrl"]
try:
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    token = uuid.uuid4().hex
    sns.publish(
        TopicArn=topic,
        Message=token,
        MessageAttributes={"check": {"DataType": "String", "StringValue": token}},
    )
    got = sqs.receive_message(QueueUrl=queue, MessageAttributeNames=["All"], WaitTimeSeconds=5)
    messages = got.get("Messages", [])
    ok = (
        len(messages) == 1
        and messages[0]["Body"] == token
        and messages[0]["MessageAttributes"]["check"]["StringValue"] == token
    )
finally:
    sns.delete_topic(TopicArn=topic)
    sqs.delete_queue(QueueUrl=queue)
sys.exit(0 if ok else 1)
