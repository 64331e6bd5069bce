package cli

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"ratchet/config"
	"ratchet/internal/kafkaclient"
)

// kafkaTimeoutMs bounds each broker request of the one-shot commands.
const kafkaTimeoutMs = 10000

// kafkaTool is what the one-shot commands (offsets, dlq) use to talk to
// Kafka: a consumer that never subscribes (so it never joins the group it
// names) and an admin client sharing its connections.
type kafkaTool struct {
	c *kafka.Consumer
	a *kafka.AdminClient
}

// openKafka connects with the group id group; nothing is consumed or
// committed unless a command asks for it.
func openKafka(cfg config.Config, group string) (*kafkaTool, error) {
	m := kafkaclient.ConsumerConfig(kafkaclient.ConsumerOptions{Brokers: cfg.Kafka.Brokers, GroupID: group,
		Properties: cfg.Kafka.Properties})
	_ = m.SetKey("go.logs.channel.enable", false)
	_ = m.SetKey("log_level", 3)
	_ = m.SetKey("enable.auto.commit", false)
	c, err := kafka.NewConsumer(m)
	if err != nil {
		return nil, fmt.Errorf("new kafka consumer: %w", err)
	}
	a, err := kafka.NewAdminClientFromConsumer(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("new kafka admin client: %w", err)
	}
	return &kafkaTool{c: c, a: a}, nil
}

func (k *kafkaTool) Close() {
	k.a.Close()
	_ = k.c.Close()
}

// topics returns the partitions of every topic in the cluster. It asks for
// all topics, never for one by name: a broker that creates topics on
// request would create a mistyped one.
func (k *kafkaTool) topics() (map[string][]int32, error) {
	md, err := k.c.GetMetadata(nil, true, kafkaTimeoutMs)
	if err != nil {
		return nil, fmt.Errorf("kafka metadata: %w", err)
	}
	out := make(map[string][]int32, len(md.Topics))
	for name, t := range md.Topics {
		if t.Error.Code() != kafka.ErrNoError {
			continue
		}
		ps := make([]int32, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ps = append(ps, p.ID)
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		out[name] = ps
	}
	return out, nil
}

// groupMembers returns how many members the group has now and its state.
// A group the coordinator does not know has none.
//
// DescribeConsumerGroups in librdkafka 2.11.1 can abort the whole process
// when the coordinator connection drops while the request is in flight.
// A long-running service must not call it; for a one-shot command that
// outcome is acceptable (the command fails, nothing was changed yet at this
// point), so the commands use it to decide whether the group is active.
func (k *kafkaTool) groupMembers(ctx context.Context, group string) (int, string, error) {
	res, err := k.a.DescribeConsumerGroups(ctx, []string{group})
	if err != nil {
		return 0, "", fmt.Errorf("describe group %s: %w", group, err)
	}
	if len(res.ConsumerGroupDescriptions) != 1 {
		return 0, "", fmt.Errorf("describe group %s: %d descriptions", group, len(res.ConsumerGroupDescriptions))
	}
	d := res.ConsumerGroupDescriptions[0]
	if code := d.Error.Code(); code != kafka.ErrNoError {
		if code == kafka.ErrGroupIDNotFound {
			return 0, "Dead", nil
		}
		return 0, "", fmt.Errorf("describe group %s: %w", group, d.Error)
	}
	return len(d.Members), d.State.String(), nil
}

// commitOffsets commits offsets for group, which must have no active
// members (the coordinator refuses a commit from outside a live group).
func (k *kafkaTool) commitOffsets(ctx context.Context, group string, offsets []kafka.TopicPartition) error {
	if len(offsets) == 0 {
		return nil
	}
	res, err := k.a.AlterConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{{Group: group, Partitions: offsets}})
	if err != nil {
		return fmt.Errorf("commit offsets of group %s: %w", group, err)
	}
	var errs []error
	for _, g := range res.ConsumerGroupsTopicPartitions {
		for _, p := range g.Partitions {
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("commit %s[%d] of group %s: %w", *p.Topic, p.Partition, group, p.Error))
			}
		}
	}
	return errors.Join(errs...)
}

// committed returns the group's committed offset of each partition of
// topic (-1 when none).
func (k *kafkaTool) committed(topic string, parts []int32) (map[int32]int64, error) {
	tps := make([]kafka.TopicPartition, len(parts))
	for i, p := range parts {
		tps[i] = kafka.TopicPartition{Topic: &topic, Partition: p}
	}
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		out[p] = -1
	}
	res, err := k.c.Committed(tps, kafkaTimeoutMs)
	var ke kafka.Error
	if errors.As(err, &ke) && ke.Code() == kafka.ErrGroupIDNotFound {
		return out, nil // a group that never committed (kfake says so; Kafka answers -1)
	}
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", topic, err)
	}
	for _, r := range res {
		if r.Error == nil && r.Offset >= 0 {
			out[r.Partition] = int64(r.Offset)
		}
	}
	return out, nil
}
