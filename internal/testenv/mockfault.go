package testenv

/*
#include <stddef.h>
#include <stdint.h>

// From librdkafka's rdkafka_mock.h (bundled with confluent-kafka-go, whose
// static library the test binary links): the mock cluster's error
// injection, which confluent-kafka-go does not expose.
typedef struct rd_kafka_mock_cluster_s rd_kafka_mock_cluster_t;
extern int rd_kafka_mock_broker_push_request_error_rtts(rd_kafka_mock_cluster_t *mcluster,
	int32_t broker_id, int16_t ApiKey, size_t cnt, ...);

// delay_next_request makes the broker's next request of key succeed but
// answer only after rtt_ms (one (error, rtt) tuple: no error).
static int delay_next_request(void *mcluster, int32_t broker_id, int16_t key, int rtt_ms) {
	return rd_kafka_mock_broker_push_request_error_rtts((rd_kafka_mock_cluster_t *)mcluster,
		broker_id, key, 1, 0, rtt_ms);
}
*/
import "C"

import (
	"testing"
	"time"
	"unsafe"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// DelayMockRequest makes the next request with Kafka API key apiKey that
// broker 1 of mc receives be handled as usual but answered only after d.
// librdkafka's mock answers the requests of a connection in order, so the
// whole connection waits with it, as it does behind a request a real
// broker never answers.
//
// It reaches into kafka.MockCluster for the C handle (its second field,
// in confluent-kafka-go v2.11.1); a layout that no longer matches fails
// the test instead of corrupting memory silently, as far as a nil check
// can tell.
func DelayMockRequest(tb testing.TB, mc *kafka.MockCluster, apiKey int16, d time.Duration) {
	tb.Helper()
	handle := (*struct {
		rk       unsafe.Pointer
		mcluster unsafe.Pointer
	})(unsafe.Pointer(mc)).mcluster
	if handle == nil {
		tb.Fatal("mock cluster: no C handle (kafka.MockCluster's layout changed?)")
	}
	if code := C.delay_next_request(handle, 1, C.int16_t(apiKey), C.int(d.Milliseconds())); code != 0 {
		tb.Fatalf("mock cluster: delay API key %d: error code %d", apiKey, int(code))
	}
}
