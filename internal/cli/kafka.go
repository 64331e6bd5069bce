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
	// readPartition ends at the position a partition EOF reports.
	_ = m.SetKey("enable.partition.eof", true)
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

// groupActive reports whether the group has members now, and its state.
// A group the cluster does not list has none.
//
// It lists the groups (a request to every broker) instead of describing
// this one: DescribeConsumerGroups and AlterConsumerGroupOffsets go through
// librdkafka's coordinator admin path, which in 2.11 can abort the whole
// process when the coordinator connection drops mid-request (librdkafka
// issue 4605). For a one-shot command that would only fail the command,
// but no production code of the module may call them
// (actors.TestNoCoordinatorAdminRequests), and nothing here needs more than
// the state.
func (k *kafkaTool) groupActive(ctx context.Context, group string) (bool, string, error) {
	res, err := k.a.ListConsumerGroups(ctx)
	if err != nil {
		return false, "", fmt.Errorf("list consumer groups: %w", err)
	}
	for _, g := range res.Valid {
		if g.GroupID != group {
			continue
		}
		switch g.State {
		case kafka.ConsumerGroupStateEmpty, kafka.ConsumerGroupStateDead:
			return false, g.State.String(), nil
		default:
			// Stable, rebalancing, and Unknown too: a state we cannot
			// read is not proof that nobody is there.
			return true, g.State.String(), nil
		}
	}
	if len(res.Errors) > 0 {
		// A broker did not answer: the group may be on it.
		return false, "", fmt.Errorf("list consumer groups: %w", errors.Join(res.Errors...))
	}
	return false, "none", nil
}

// commitOffsets commits offsets for the tool's group, which must have no
// active members: the consumer never joined it, so this is a commit from
// outside the group (generation -1), which the coordinator accepts only
// while the group is empty. It goes through the consumer's own group
// coordinator connection, not the admin path.
func (k *kafkaTool) commitOffsets(offsets []kafka.TopicPartition) error {
	if len(offsets) == 0 {
		return nil
	}
	res, err := k.c.CommitOffsets(offsets)
	if err != nil {
		return fmt.Errorf("commit offsets: %w", err)
	}
	var errs []error
	for _, p := range res {
		if p.Error != nil {
			errs = append(errs, fmt.Errorf("commit %s[%d]: %w", *p.Topic, p.Partition, p.Error))
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
